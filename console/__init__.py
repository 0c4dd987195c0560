"""The console: a Textual dashboard of a gated engine, fed by the gRPC API or a recording."""
