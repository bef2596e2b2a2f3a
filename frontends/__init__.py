"""Frontends: lift source models into the qconvert IR (installed as `qconvert.frontends`)."""
