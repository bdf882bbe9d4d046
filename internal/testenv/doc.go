// Package testenv starts the real servers tests run against: a private
// redis-server per test package (loaded with the rendered ACL, so code under
// test connects as api_backend and the suite proves the ACL suffices) and a
// private PostgreSQL cluster, in which every package creates its own database.
//
// The private cluster and bouncers listen on 127.0.0.1, which every account
// on the machine reaches, so they ask every client for a password
// (scram-sha-256), random per cluster; it travels inside the URLs, which go
// to processes through their environment, never their arguments.
//
// Nothing here mocks Redis or PostgreSQL. A shared PostgreSQL is used only
// when HAN_TEST_DATABASE_URL (set by scripts/test.sh for its own private
// cluster) or DATABASE_URL is set on purpose; Redis is always private because
// fixed han:* key names make a shared server unsafe for parallel packages.
//
// With HAN_TEST_PGBOUNCER=1 a private PgBouncer in transaction pooling mode
// stands between the package and its database (Env.DatabaseURL through it,
// in the pgx exec mode HAN_TEST_DB_EXEC_MODE, default exec; Env.DirectURL
// straight to PostgreSQL, for migrations). Debian's pgbouncer refuses to run
// as root, so it runs as the "postgres" system user like PostgreSQL. A
// missing pgbouncer fails the package; BouncerFor, used by tests that start
// a bouncer of their own, skips instead, except under CI=true.
//
// StartCluster starts a private Redis Cluster instead (3 masters with one
// replica each by default, cluster-node-timeout 1 s, every node loaded with
// the cluster ACL and created through the admin user); only
// internal/clustertest and cmd/withcluster use one, every other package
// keeps its standalone redis-server.
//
// A RedisServer is safe for concurrent use; Kill and Restart serialise on it.
package testenv
