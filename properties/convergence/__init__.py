"""The tiny-model convergence run: data, model, envelope and the run itself."""
