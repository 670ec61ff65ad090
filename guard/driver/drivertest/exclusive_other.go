//go:build !unix

package drivertest

import "testing"

// Exclusive does nothing where flock is not available: the tests it keeps
// apart then only share the machine.
func Exclusive(testing.TB, string) {}
