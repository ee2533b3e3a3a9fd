"""Language models as the searches use them: loading (`load`) and the width-invariant attention the
batched searches rely on (`attention`)."""
