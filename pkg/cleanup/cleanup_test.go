// SPDX-License-Identifier: Apache-2.0

package cleanup

import (
	"errors"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"
)

func TestRunNewestFirstAndKeepsGoing(t *testing.T) {
	var s Stack
	var ran []string
	for _, name := range []string{"a", "b", "c"} {
		s.Push("undo "+name, func() error {
			ran = append(ran, name)
			if name == "b" {
				return errors.New("b is stuck")
			}
			return nil
		})
	}
	if d := cmp.Diff([]string{"undo c", "undo b", "undo a"}, s.Steps()); d != "" {
		t.Errorf("Steps (-want +got):\n%s", d)
	}
	err := s.Run()
	if d := cmp.Diff([]string{"c", "b", "a"}, ran); d != "" {
		t.Errorf("order (-want +got):\n%s", d)
	}
	if err == nil || err.Error() != "undo b: b is stuck" {
		t.Errorf("Run = %v", err)
	}
	if s.Len() != 0 || s.Run() != nil {
		t.Error("the stack is not empty after Run")
	}
}

func TestRunIfFailed(t *testing.T) {
	var s Stack
	ran := 0
	s.Push("x", func() error { ran++; return nil })
	var err error
	s.RunIfFailed(&err)
	if ran != 0 || s.Len() != 1 {
		t.Fatal("ran the stack although nothing failed")
	}

	err = types.NewError(types.ErrInvalidNetworkConfig, "invalid mtu", "")
	s.Push("delete veth v1", func() error { return errors.New("device busy") })
	s.RunIfFailed(&err)
	if ran != 1 {
		t.Errorf("ran %d inverses, want 1 (the failing one runs too)", ran)
	}
	var cni *types.Error
	if !errors.As(err, &cni) || cni.Code != types.ErrInvalidNetworkConfig {
		t.Errorf("the original error's CNI code is lost: %v", err)
	}
	if !strings.Contains(err.Error(), "invalid mtu") || !strings.Contains(err.Error(), "delete veth v1: device busy") {
		t.Errorf("error = %q, want the failure and the undo failure", err)
	}
}
