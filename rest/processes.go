package rest

import "net/http"

// Placeholder handlers: the processes work replaces this file.

func (a *api) startProcess(w http.ResponseWriter, r *http.Request)  { notYet(w) }
func (a *api) listProcesses(w http.ResponseWriter, r *http.Request) { notYet(w) }
func (a *api) getProcess(w http.ResponseWriter, r *http.Request)    { notYet(w) }
func (a *api) processOutput(w http.ResponseWriter, r *http.Request) { notYet(w) }
func (a *api) processStdin(w http.ResponseWriter, r *http.Request)  { notYet(w) }
func (a *api) processSignal(w http.ResponseWriter, r *http.Request) { notYet(w) }
