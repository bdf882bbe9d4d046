// Package clustertest proves that the service's Redis code runs on a Redis
// Cluster: it holds only tests, run against private clusters of
// redis-server processes that internal/testenv starts (3 masters, 3
// replicas, every node loaded with the cluster ACL, the code under test
// connected as api_backend through rds.NewRedis and a cluster URL).
//
// Its ordinary tests share one cluster, run one after another and flush it
// between tests; a test that fails a node over or moves a slot starts a
// cluster of its own, since it breaks the one it runs on. The TestGateways
// tests run the real program: cmd/han-gateway built once per test binary
// and started as three processes on a cluster, driven over HTTP and
// WebSocket as clients drive it. Every other test
// package keeps its private standalone redis-server: this one is the only
// place a cluster runs, so its behaviour on a cluster is checked here, next
// to nothing it could be mistaken for.
package clustertest
