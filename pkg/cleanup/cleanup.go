// SPDX-License-Identifier: Apache-2.0

// Package cleanup is the undo stack every podwire change uses: each side effect pushes
// its inverse as it happens, and a change that fails runs the inverses newest first,
// so it leaves exactly what was there before it started.
//
//	var undo cleanup.Stack
//	defer undo.RunIfFailed(&err) // err is the function's named result
//	if err := create(x); err != nil {
//		return err
//	}
//	undo.Push("delete "+x, func() error { return remove(x) })
//
// An inverse is pushed only once its side effect happened, and only for what this
// change created: something found already there is not this change's to remove.
package cleanup

import (
	"errors"
	"fmt"
)

// Stack holds the inverses of a change's side effects, newest last. The zero value is
// an empty stack. A Stack is not safe for concurrent use.
type Stack struct {
	steps []step
}

type step struct {
	what string
	undo func() error
}

// Push records the inverse of a side effect that just happened. what names it for
// error messages ("delete veth veth1234").
func (s *Stack) Push(what string, undo func() error) {
	s.steps = append(s.steps, step{what, undo})
}

// Len is the number of inverses recorded.
func (s *Stack) Len() int { return len(s.steps) }

// Steps names the recorded inverses, newest first (the order Run runs them in).
func (s *Stack) Steps() []string {
	out := make([]string, 0, len(s.steps))
	for i := len(s.steps) - 1; i >= 0; i-- {
		out = append(out, s.steps[i].what)
	}
	return out
}

// Run runs every inverse, newest first, and empties the stack. It keeps going when one
// fails and returns all failures joined, each named by its step.
func (s *Stack) Run() error {
	var errs []error
	for i := len(s.steps) - 1; i >= 0; i-- {
		if err := s.steps[i].undo(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.steps[i].what, err))
		}
	}
	s.steps = nil
	return errors.Join(errs...)
}

// RunIfFailed runs the stack when *err is set (deferred with the caller's named
// result). Failures to undo are added to *err after the original error, which stays
// first in the chain, so its CNI code is the one reported.
func (s *Stack) RunIfFailed(err *error) {
	if *err == nil {
		return
	}
	if uerr := s.Run(); uerr != nil {
		*err = &undoError{err: *err, undo: uerr}
	}
}

// undoError is a failed change whose undo failed too.
type undoError struct {
	err, undo error
}

func (e *undoError) Error() string {
	return fmt.Sprintf("%v (undoing the partial change also failed: %v)", e.err, e.undo)
}

// Unwrap keeps the original error first, so errors.As finds its CNI code.
func (e *undoError) Unwrap() []error { return []error{e.err, e.undo} }
