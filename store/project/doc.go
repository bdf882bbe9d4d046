// Package project is the data and the domain rules of the project Redis
// API (docs/project-redis-api.md) on Redis alone: the physical keys of a
// project (Keys, ModuleKeys), the cache and its listing (Cache), topics,
// subscriptions, claims, acks and receipts (Queue), the project and module
// byte budgets, the instance's lease on the module budget and the
// reconciler (ModuleBudget, BudgetReconciler), the
// eviction-policy gate (EvictionGate) and the import of legacy cache
// entries (ImportLegacyCache).
//
// Its limits are defined here once (limits.go) and every other place, the
// handlers and the scripts' arguments, refers to them. Types here carry no
// wire JSON: the handlers in restapi/project own the shapes the API shows; the JSON
// tags that remain are the encodings of records stored in Redis.
//
// The PostgreSQL side of a project (members, settings, the legacy
// deadline) is package store, which writes the Mirror kept here inside its
// transaction. This package links no PostgreSQL driver.
//
// Every script call touches only the keys of one project (one hash tag),
// or only the module budget's keys. Queue, Cache, ModuleBudget and
// EvictionGate are safe for concurrent use.
package project
