//go:build !race

package restapi_test

// budgetSlack is how many Redis budgets a fail-fast answer may take.
const budgetSlack = 1
