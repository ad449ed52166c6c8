"""What a plugin author uses: the plugin contract, the capability model, discovery and the CPU simulation."""
