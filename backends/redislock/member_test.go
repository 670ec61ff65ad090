package redislock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// TestSetOutlivesLongerMember: a reader with a minute's lease, joining a
// set whose first reader has 300ms, moves the set's expiry to its own
// deadline (add_member): the set expiring with the first reader would take
// the second's hold with it, and a writer would be granted over it.
func TestSetOutlivesLongerMember(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := newClient(t)
	l := newLocker(t, c)
	key := testKey(t)
	if _, err := l.AcquireRead(ctx, key, driver.AcquireOptions{TTL: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.AcquireRead(ctx, key, driver.AcquireOptions{TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	readers := namesOf(key).readers()
	first := c.ZRangeWithScores(ctx, readers, 0, 0).Val()[0].Score
	eventually(t, "the first reader's deadline passes on the server's clock", func() bool {
		return float64(c.Time(ctx).Val().UnixMilli()) > first+5
	})
	wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer wcancel()
	if _, err := l.AcquireWrite(wctx, key, driver.AcquireOptions{TTL: time.Minute}); err == nil {
		t.Error("a writer granted while a reader holds for a minute")
	}
}
