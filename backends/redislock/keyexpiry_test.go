package redislock

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard/driver"
)

const dayMs = 86400000

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

// keyUntilDayAfter makes key's state a free lock whose key expires at the
// end of the day after tomorrow (server clock): a lease of a minute taken
// on it needs no later day, one of three days does.
func keyUntilDayAfter(t *testing.T, admin *goredis.Client, key string) {
	t.Helper()
	ctx := context.Background()
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	day := now.UnixMilli()/dayMs + 3
	if err := admin.Do(ctx, "set", lockKeyOf(key), "0:1:"+strconv.FormatInt(day, 10)+":0:", "pxat", day*dayMs).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestPutBackRecordExpires: a release that takes a waiter's record out of
// the waiters and puts it back (a record of an earlier version, which it
// does not hand the lock to) into the set that the taking emptied gives
// the set the record's deadline as its expiry by PEXPIRE, which the
// documented rules have: by PEXPIREAT, it was refused after the record was
// back, for a user without it.
func TestPutBackRecordExpires(t *testing.T) {
	ctx := context.Background()
	admin, user := serverWithout(t, "+pexpireat")
	const key = "warden:putback/record"
	keyUntilDayAfter(t, admin, key)
	lock, waiters := lockWaitersOf(key)
	lease, err := user().Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// A waiter of an earlier version announced itself: its record has no
	// TTL, and the state's waiting flag is set.
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ZAdd(ctx, waiters, goredis.Z{Score: float64(now.UnixMilli() + 60000), Member: "\nearlier"}).Err(); err != nil {
		t.Fatal(err)
	}
	f := strings.Split(admin.Get(ctx, lock).Val(), ":")
	f[3] = "1"
	if err := admin.Do(ctx, "set", lock, strings.Join(f, ":"), "keepttl").Err(); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Errorf("release: %v", err)
	}
	if n := admin.ZCard(ctx, waiters).Val(); n != 1 {
		t.Errorf("%d records left, want the one put back", n)
	}
	if pttl := admin.PTTL(ctx, waiters).Val(); pttl <= 0 || pttl > time.Minute {
		t.Errorf("the waiters' pttl %v, want the record's minute at most", pttl)
	}
}
