"""`tensorfold bench ...`: measurements of a running server (serving.py), of the engine in this process (local.py)
and of drafting (drafter.py)."""
