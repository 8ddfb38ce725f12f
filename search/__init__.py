"""search: hyperparameter search for deep learning on Ray Tune, Optuna and ASHA."""

__all__ = ["__version__"]
__version__ = "0.1.0"
