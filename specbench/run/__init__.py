"""Running a benchmark: the settings read once, one request at a time (single.py) or many at once
(serving.py), the AR baseline, the lossless check and its rounding band, metrics and result files.
Only this package reads the run's settings; everything below it receives what it needs, typed."""
