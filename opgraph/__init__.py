"""opgraph: abstract convnet op graphs, lowering passes and an autotuning meta-optimizer."""
