"""Language models as the searches use them: loading (`load`), the wrapped model (`loaded`), the
padding that keeps each row's bits (`padding`) and width-invariant attention (`attention`)."""
