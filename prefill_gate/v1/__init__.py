"""Generated from protos/ by `python -m control.protogen`; do not edit."""
