"""tensorfold."""
