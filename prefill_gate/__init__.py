"""The contract package: `v1/` is generated from protos/ by `python -m control.protogen` (do not edit);
`convert.py` is the one hand-written mapping from engine values to those messages."""
