package main

import (
	"context"
	"fmt"

	"github.com/warden-go/warden/backends/backendurl"
)

// unreachable is a backend that could not be opened: the message names the
// flag and the (masked) URL, the exit status is 2.
type unreachable struct {
	flag string
	url  *backendurl.URL
	err  error
}

func (e *unreachable) Error() string {
	return fmt.Sprintf("-%s %s: unreachable: %v", e.flag, e.url, e.url.RedactError(e.err))
}

// quietRedis is a go-redis logger that drops what it is given.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
