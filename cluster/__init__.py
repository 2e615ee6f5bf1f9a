"""strictq as a cluster: partitions owned by queue servers, replicated on NATS JetStream (docs/cluster.md)."""
