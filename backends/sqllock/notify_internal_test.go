package sqllock

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// pending counts the waiters holding a wake-up.
func pending(ws ...*waiter) int {
	n := 0
	for _, w := range ws {
		if len(w.c) > 0 {
			n++
		}
	}
	return n
}

// TestDispatchWakesOne: one notification wakes one local waiter of the name,
// however many wait, so that a release does not start a herd inside the
// process; the next notification wakes another; a waiter giving up hands its
// unused wake-up on.
func TestDispatchWakesOne(t *testing.T) {
	n := newNotifier(nil, DefaultTable, nil) // no pool: no listener, bookkeeping only
	a, b, c := n.join("k"), n.join("k"), n.join("k")
	other := n.join("other")

	n.dispatch("k")
	if got := pending(a, b, c); got != 1 || len(a.c) != 1 {
		t.Fatalf("after one notification: %d waiters woken (first: %d), want the first one only", got, len(a.c))
	}
	if len(other.c) != 0 {
		t.Fatal("a notification for k woke a waiter of another name")
	}
	n.dispatch("k")
	if got := pending(a, b, c); got != 2 || len(b.c) != 1 {
		t.Fatalf("after two notifications: %d waiters woken (second: %d), want the first two", got, len(b.c))
	}

	// b gives up without consuming its wake-up: c gets it.
	b.leave(true)
	if len(c.c) != 1 {
		t.Fatal("the wake-up of a waiter that gave up was not handed on")
	}
	// a acquired: its wake-up is spent, nobody else is woken.
	<-c.c
	a.leave(false)
	if len(c.c) != 0 {
		t.Fatal("a waiter that acquired handed on its wake-up")
	}

	n.wakeAll()
	if pending(c, other) != 2 {
		t.Fatal("wakeAll left a waiter asleep")
	}
	c.leave(true)
	other.leave(true)
	if n.count != 0 || len(n.subs) != 0 {
		t.Fatalf("after every waiter left: count %d, %d names", n.count, len(n.subs))
	}
}

func TestChannelName(t *testing.T) {
	if got := channelName(DefaultTable); got != DefaultTable {
		t.Errorf("channel of %q: %q", DefaultTable, got)
	}
	long := "a_schema_with_a_rather_long_name_for_testing.a_table_whose_name_is_long_too"
	got := channelName(long)
	if len(got) > maxChannel || got == channelName(long+"x") {
		t.Errorf("channel of a %d-byte name: %q", len(long), got)
	}
}

// The MySQL driver's deadlock and lock wait errors are retried, told by
// their text so that the package need not link the driver.
func TestRetryable(t *testing.T) {
	for _, err := range []error{
		&mysql.MySQLError{Number: 1213, SQLState: [5]byte{'4', '0', '0', '0', '1'}, Message: "Deadlock found"},
		&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"},
		fmt.Errorf("acquire: %w", &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}),
	} {
		if !retryable(context.Background(), nil, err, 0) {
			t.Errorf("%v: not retried", err)
		}
	}
	for _, err := range []error{
		&mysql.MySQLError{Number: 1062, Message: "Duplicate entry"},
		&mysql.MySQLError{Number: 12130, Message: "not a deadlock"},
		errors.New("Error 1213 is what this is not"),
	} {
		if retryable(context.Background(), nil, err, 0) {
			t.Errorf("%v: retried", err)
		}
	}
}
