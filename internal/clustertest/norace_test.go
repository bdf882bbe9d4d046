//go:build !race

package clustertest_test

// raceBuild: the tests run without -race, and so do the gateways.
const raceBuild = false
