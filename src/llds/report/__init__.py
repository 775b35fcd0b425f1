"""After the run: the HTML report, its plots and words, and probe comparisons."""
