package fencetest

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// TestModel: the checker the suite relies on tells a fenced register's
// histories from the ones a store that misses the fence produces.
func TestModel(t *testing.T) {
	w := func(client int, token uint64, value string, call, ret int64, accepted bool) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: input{token: token, value: value}, Call: call, Output: output{accepted: accepted}, Return: ret}
	}
	rd := func(client int, call, ret int64, highest uint64, value string) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: input{read: true}, Call: call, Output: output{state: register{highest: highest, value: value}}, Return: ret}
	}
	for _, c := range []struct {
		name    string
		history []porcupine.Operation
		want    porcupine.CheckResult
	}{
		{"sequential", []porcupine.Operation{w(0, 5, "a", 0, 1, true), w(1, 4, "b", 2, 3, false), rd(2, 4, 5, 5, "a")}, porcupine.Ok},
		{"overlapping writes, either order", []porcupine.Operation{w(0, 5, "a", 0, 10, true), w(1, 4, "b", 1, 9, true), rd(2, 11, 12, 5, "a")}, porcupine.Ok},
		{"stale accepted after a higher one", []porcupine.Operation{w(0, 5, "a", 0, 1, true), w(1, 4, "b", 2, 3, true)}, porcupine.Illegal},
		{"equal refused", []porcupine.Operation{w(0, 5, "a", 0, 1, true), w(0, 5, "b", 2, 3, false)}, porcupine.Illegal},
		{"stale write's value read", []porcupine.Operation{w(0, 5, "a", 0, 1, true), w(1, 4, "b", 2, 3, false), rd(2, 4, 5, 5, "b")}, porcupine.Illegal},
		{"unknown outcome, applied", []porcupine.Operation{
			{ClientId: 0, Input: input{token: 5, value: "a"}, Call: 0, Output: output{unknown: true}, Return: 1 << 62},
			rd(1, 2, 3, 5, "a")}, porcupine.Ok},
	} {
		if got := porcupine.CheckOperationsTimeout(fencedRegister, c.history, 0); got != c.want {
			t.Errorf("%s: linearizable %v, want %s", c.name, got, c.want)
		}
	}
}
