// Package testenv starts the real servers tests run against: a private
// redis-server per test package (loaded with the rendered ACL, so code under
// test connects as api_backend and the suite proves the ACL suffices) and a
// private PostgreSQL cluster, in which every package creates its own database.
//
// Nothing here mocks Redis or PostgreSQL. A shared PostgreSQL is used only
// when HAN_TEST_DATABASE_URL (set by scripts/test.sh for its own private
// cluster) or DATABASE_URL is set on purpose; Redis is always private because
// fixed han:* key names make a shared server unsafe for parallel packages.
//
// A RedisServer is safe for concurrent use; Kill and Restart serialise on it.
package testenv
