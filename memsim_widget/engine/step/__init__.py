"""The moments of a training step on one rank: ``moments`` (the table of named groups live at each instant),
``timeline`` (the groups' items and the moments built from them), ``lazy_items`` (items whose formula text is built
when read) and ``rank_estimate`` (one rank's result: its moments and their peak)."""
