"""The coverage benchmark: how many of a zoo's models (or torch's ops) translate and pass the proof."""
