// Package archtest holds no code, only a test: it keeps the package table of
// docs/architecture.md true. The table names, for every package of the
// module, its job and the project packages it may import; the test reads the
// table and the real import graph (`go list -json ./...`) and fails on an
// import the table does not allow, on a package the table does not list and
// on a row naming a package that no longer exists. A second test keeps the
// PostgreSQL driver (github.com/jackc/...) out of the packages that must not
// reach it: presence, ratelimit, pubsub, store/rds and store/project do not
// link it, no
// restapi package imports it (the rule is stated in docs/architecture.md).
// A third keeps tests in their place: no test outside cmd/han-gateway (the
// whole-server tests) and the restapi tree imports restapi, and no folder
// holds only tests, this one and internal/clustertest excepted.
//
// Production imports are checked against the "may import" column. Test
// imports (in-package and external _test.go files) may reach that set, the
// "tests may also import" column and internal/testenv, which every test
// package uses for its servers and the goroutine-leak check.
//
// It lives in a package of its own rather than beside one of the packages it
// checks so that no package's tests own a rule about all of them.
package archtest
