"""The queue on the pull request: a check run or commit status with level, place and ETA."""
