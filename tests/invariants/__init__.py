"""The invariant matrix of issue 30: models x backends x output forms x user moves."""
