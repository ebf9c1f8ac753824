"""One module per join family, each holding that family's whole semantics."""
