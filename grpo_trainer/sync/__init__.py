"""Weight-sync strategies: how new trainer weights reach the inference server, one per mode."""
