"""Backends: lower the qconvert IR to artifacts and run them on real engines (`qconvert.backends`)."""
