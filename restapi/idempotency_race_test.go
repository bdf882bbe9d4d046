//go:build race

package restapi_test

// budgetSlack is how many Redis budgets a fail-fast answer may take: 3 under
// the race detector, which slows everything down.
const budgetSlack = 3
