// Package projectapi is the HTTP face of the project Redis API, mounted by
// restapi under /projects/{projectId}/redis: the routes of the snapshot,
// settings, cache, topics, subscriptions, claims and receipts, their wire
// DTOs, and the parsing and validation of their input. The data and the
// domain rules are store/project's, the PostgreSQL side of a project is
// store's; this package turns requests into their calls and their results
// into answers.
//
// Its directory is restapi/project; the package is named projectapi so that
// it reads apart from store/project, which every file here imports as
// project.
//
// Every route is one value of route (route.go): the role it needs, the
// resource its path names, the body it reads, its parse and its domain
// call; serve runs these phases in the same order for every route, so the
// order of the checks, and with it which error a request gets first, is
// the same everywhere: access (404 project_not_found, 403 forbidden), the
// path id, the body (415, 413, invalid_json or a field's own code), the
// fields, the eviction-policy gate for writes, then the domain.
//
// What the API server owns is lent through Deps and Host, never copied:
// authentication and the rate-limit seam (middleware), the body reader, the
// JSON writer, the page-limit parser and the one error writer. A handler
// returns its failure; the per-method dispatch hands it to Host.Fail, so
// the server's error table (restapi/errors.go) stays the one place that
// maps a domain error to a status and code. The error values of the API's
// own codes are defined here (errors.go) on restapi/apierr.
//
// The HTTP tests of these routes live in restapi (project_*_test.go): they
// run the API mounted in the real server, with its authentication, error
// table and metrics, against real Redis and PostgreSQL, which a harness
// here could only imitate. This package's own tests cover what needs no
// server (the parsing of a cache PUT body).
//
// An API is safe for concurrent use.
package projectapi
