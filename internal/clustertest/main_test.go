package clustertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/han-app/gateway/internal/testenv"
	"github.com/han-app/gateway/store/rds"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	testenv.Main(m, testenv.Options{Cluster: true, Postgres: true, Check: removeGatewayBuild}, &env)
}

// shared returns an api_backend client of the package's cluster, opened
// as the service opens it, after flushing the cluster.
func shared(t *testing.T) redis.UniversalClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := env.Cluster.FlushAll(ctx); err != nil {
		t.Fatal(err)
	}
	return open(t, env.Cluster)
}

// open returns an api_backend client of c; the test closes it.
func open(t *testing.T, c *testenv.RedisCluster) redis.UniversalClient {
	t.Helper()
	rdb, err := rds.NewRedis(c.URL(), rds.RedisConfig{ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}
