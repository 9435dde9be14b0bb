"""Weight formats: how a matrix is held in memory and what its values are."""
