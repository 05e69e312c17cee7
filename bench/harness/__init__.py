"""What every comparison runs on: its command-line skeleton and contestant processes, our server as a
process, HTTP clients, the open and closed loads, deterministic inputs, statistics and the report.
Nothing here imports a comparison."""
