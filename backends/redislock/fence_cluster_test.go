//go:build clusters

package redislock

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/fence/fencetest"
)

// TestFenceConformanceCluster: the suite on the Redis Cluster of
// scripts/clusters.sh (eval "$(scripts/clusters.sh env)"; go test -tags
// clusters), with the resources' hash tags shared by the fence and data
// keys.
func TestFenceConformanceCluster(t *testing.T) {
	addrs := os.Getenv("WARDEN_CLUSTER_REDIS")
	if addrs == "" {
		t.Fatal("WARDEN_CLUSTER_REDIS is not set: eval \"$(scripts/clusters.sh env)\"")
	}
	fencetest.Run(t, fencetest.Backend{
		New: func(t testing.TB) fencetest.Store {
			c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: strings.Split(addrs, ",")})
			t.Cleanup(func() { c.Close() })
			return newFenceStore(t, c)
		},
		NoCut:    "a Cluster client follows the slot map to the nodes themselves, past any relay; the cut runs on a single node",
		Resource: fenceTag,
	})
}

// TestFenceClusterCrossSlot: a fence and data key in different slots are
// refused by the Cluster before anything is written.
func TestFenceClusterCrossSlot(t *testing.T) {
	ctx := context.Background()
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: strings.Split(os.Getenv("WARDEN_CLUSTER_REDIS"), ",")})
	defer c.Close()
	f, err := NewFence(c)
	if err != nil {
		t.Fatal(err)
	}
	n := strconv.FormatInt(time.Now().UnixNano(), 10)
	data := "{other-" + n + "}:x"
	err = f.Set(ctx, fence.Claim{Resource: "untagged-" + n, Token: 1}, data, "v", 0)
	if err == nil || errors.Is(err, fence.ErrStaleToken) || !strings.Contains(err.Error(), "CROSSSLOT") {
		t.Fatalf("keys in two slots: %v, want CROSSSLOT", err)
	}
	if c.Exists(ctx, data).Val() != 0 {
		t.Fatal("the data was written")
	}
}
