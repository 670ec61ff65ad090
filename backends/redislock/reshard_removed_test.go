package redislock

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

// TestReshardRemovedMasterInView: clients that still count a master
// emptied and removed from the cluster among their seed addresses, as a
// deployment's configuration keeps them, may load their slot map from it,
// which serves no slot any more, and send it commands, which it answers
// "CLUSTERDOWN Hash slot not served" having run nothing: acquisitions and
// releases go on working, on the members.
func TestReshardRemovedMasterInView(t *testing.T) {
	c := startReshardCluster(t, 2)
	d := c.add()
	key := "reshard/removed"
	slot := c.slot(lockKeyOf(key))
	c.moveSlot(slot, c.owner(slot), d, 10, nil)
	c.moveSlot(slot, d, c.shards[0], 10, nil)
	c.remove(d)
	ctx := context.Background()
	for i := range 60 {
		cc := c.client(func(o *goredis.ClusterOptions) { o.Addrs = append(o.Addrs, d.addr) })
		l := newLocker(t, cc)
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lease, err := l.Acquire(actx, fmt.Sprintf("%s/%d", key, i), driver.AcquireOptions{TTL: 10 * time.Second})
		if err == nil {
			err = lease.Release(actx)
		}
		cancel()
		if err != nil {
			t.Fatalf("client %d, with the removed master among its seeds: %v", i, err)
		}
	}
}
