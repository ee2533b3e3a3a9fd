"""What a search costs: FLOPs from a model's shape and this machine's rates (`flops`), and measured
device step costs (`devices`)."""
