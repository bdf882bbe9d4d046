//go:build race

package clustertest_test

// raceBuild: the tests run with -race, so the gateways they start are
// built with it too, and a data race in them fails the test.
const raceBuild = true
