"""kvpool.oracle: differential testing against the model (not built yet; see the open issues)."""
