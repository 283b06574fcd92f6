"""Reading Kubernetes node and pod objects (plain API dicts): quantities, selectors, taints."""
