"""trainer: stage-2 adversarial training on Hugging Face Accelerate that cannot deadlock.

Importing the package touches no device and imports no heavy library.
"""

__version__ = "0.1.0"
