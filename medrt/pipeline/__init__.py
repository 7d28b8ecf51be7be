"""The streaming pipeline: stages on worker threads joined by bounded queues with a per-edge policy."""
