"""The pipeline's stages as pure functions: masks, scores, normalisers, validation."""
