package redislock

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// TestRefusedUnrecordKeepsTheKeysDay: a waiting contender's attempt that
// swaps its grant in (SET GET) and then takes its waiter's record out
// moves the key's expiry with the state's day before the ZREM: refused (a
// user without ZREM), the ZREM stops the script after the grant's writes.
// Taken out first, the refused ZREM stopped it with the SET GET's state,
// its later day written and the key's old expiry kept, hours before the
// lease's end, and the next grant, finding the day, would not move it.
func TestRefusedUnrecordKeepsTheKeysDay(t *testing.T) {
	ctx := context.Background()
	admin, _ := serverWithout(t, "+zrem")
	c := goredis.NewClient(&goredis.Options{Addr: admin.Options().Addr, Username: "w", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	const key = "warden:unrecord/day"
	keyUntilDayAfter(t, admin, key)
	lock, waiters := lockWaitersOf(key)
	ttl := strconv.FormatInt((72 * time.Hour).Milliseconds(), 10)
	// Mode '1' with an earlier attempt unanswered ('1'): the attempt that
	// got no answer may have recorded the contender, so a grant takes its
	// record out.
	record := "60000\nch\n" + ttl + "\nowner"
	err := c.Eval(ctx, acquireSrc, []string{lock, waiters}, "owner", ttl, "1", record, "1").Err()
	if err == nil {
		t.Fatal("the grant's ZREM was not refused: the test proves nothing")
	}
	if v := admin.Get(ctx, lock).Val(); !strings.HasSuffix(v, ":owner") {
		t.Fatalf("the state %q, want the contender's grant", v)
	}
	keyCovers(t, admin, key, "granted for three days, its record's ZREM refused ("+err.Error()+")")
}
