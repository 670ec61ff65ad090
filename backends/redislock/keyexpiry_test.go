package redislock

import (
	"context"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
)

// TestLostKeyStaysLost: a renewal or a release of a lock whose key is gone
// (deleted by hand, a restart without persistence) writes nothing. Their
// SET created the key, without an expiry, and the script took it back by
// DEL: for a user without DEL the key stayed for good, a renewal's with
// the lease extended, which the next renewal then took for its own.
func TestLostKeyStaysLost(t *testing.T) {
	ctx := context.Background()
	admin, user := serverWithout(t, "+del")
	l := user()
	const key = "warden:lost/key"
	lease, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"Refresh", func() error { return lease.Refresh(ctx, time.Minute) }},
		{"RefreshBatch", func() error { return l.RefreshBatch(ctx, []driver.Lease{lease}, time.Minute)[0] }},
		{"Refresh again", func() error { return lease.Refresh(ctx, time.Minute) }},
		{"Release", func() error { return lease.Release(ctx) }},
	}
	for _, s := range steps {
		if err := admin.Del(ctx, lockKeyOf(key)).Err(); err != nil {
			t.Fatal(err)
		}
		err := s.do()
		if s.what != "Release" && err == nil {
			t.Errorf("%s of a lost key succeeded", s.what)
		}
		if n := admin.Exists(ctx, lockKeyOf(key)).Val(); n != 0 {
			v := admin.Get(ctx, lockKeyOf(key)).Val()
			t.Errorf("%s of a lost key left it: %q, pttl %v (err %v)", s.what, v, admin.PTTL(ctx, lockKeyOf(key)).Val(), err)
		}
	}
}
