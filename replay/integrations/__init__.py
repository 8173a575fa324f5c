"""Record runs whose loop a framework owns: ``replay.integrations.lightning`` (PyTorch
Lightning), ``replay.integrations.transformers`` (Hugging Face). Each is imported on its own
and needs its framework (``pip install torch-replay[lightning]``); ``import replay`` imports
none of them."""
