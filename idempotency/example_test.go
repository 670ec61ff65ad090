package idempotency_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/warden-go/warden/idempotency"
)

// A message consumer that may see the same message twice credits the
// account once: the message ID is the key, the payload the fingerprint.
func ExampleExecutor_Do() {
	exec, err := idempotency.New(idempotency.NewMemoryStore(), idempotency.WithScope("payments-consumer"))
	if err != nil {
		panic(err)
	}
	credit := func(ctx context.Context) ([]byte, error) {
		fmt.Println("crediting 10 EUR")
		return []byte("credited 10 EUR"), nil
	}
	ctx := context.Background()
	for range 2 { // the broker delivers the message twice
		res, err := exec.Do(ctx, "msg-7f3a", "credit:acct-1:10EUR", credit)
		fmt.Printf("%s (replayed: %v, err: %v)\n", res.Response, res.Replayed, err)
	}
	// The same message ID with another payload is refused.
	_, err = exec.Do(ctx, "msg-7f3a", "credit:acct-1:99EUR", credit)
	fmt.Println(errors.Is(err, idempotency.ErrFingerprintMismatch))
	// Output:
	// crediting 10 EUR
	// credited 10 EUR (replayed: false, err: <nil>)
	// credited 10 EUR (replayed: true, err: <nil>)
	// true
}
