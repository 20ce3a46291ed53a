package rest

import "net/http"

// Placeholder handlers: the commands work replaces this file.

func (a *api) runCommand(w http.ResponseWriter, r *http.Request)   { notYet(w) }
func (a *api) listCommands(w http.ResponseWriter, r *http.Request) { notYet(w) }
func (a *api) deleteShell(w http.ResponseWriter, r *http.Request)  { notYet(w) }
