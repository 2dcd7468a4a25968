"""kvpool.proofs: z3 proofs over the model (not built yet; see the project's open issues)."""
