{{/*
Names. Kubernetes names are DNS labels (63 characters), so every name is
truncated there and stripped of a trailing dash.
*/}}
{{- define "torchfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "torchfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "torchfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "torchfleet.labels" -}}
helm.sh/chart: {{ include "torchfleet.chart" . }}
{{ include "torchfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: torchfleet
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The stable subset used in selectors (never add a changing label here). */}}
{{- define "torchfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "torchfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "torchfleet.operator.selectorLabels" -}}
{{ include "torchfleet.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "torchfleet.operator.labels" -}}
{{ include "torchfleet.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "torchfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "torchfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: a digest pins it; otherwise the tag, or appVersion. */}}
{{- define "torchfleet.operator.image" -}}
{{- $image := .Values.operator.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{- define "torchfleet.defaultTrainerImage" -}}
{{- default (printf "ghcr.io/torchfleet/trainer:%s" .Chart.AppVersion) .Values.operator.defaults.trainerImage }}
{{- end }}

{{/*
Namespaces the operator reconciles, de-duplicated; empty means all. The
release namespace is not added implicitly: the operator only needs its own
namespace if jobs are submitted there.
*/}}
{{- define "torchfleet.watchNamespaces" -}}
{{- .Values.operator.watchNamespaces | uniq | toJson }}
{{- end }}

{{/*
RBAC rules for the namespaced objects the operator reconciles, shared by the
ClusterRole (cluster-wide mode) and the per-namespace Roles (namespaced mode),
so the two modes can never grant different verbs. Exactly the calls the
operator makes (operator/torchfleet_operator/handlers.py and kube.py):
- trainingjobs: kopf lists and watches them into its index; the operator
  deletes a finished job once ttlSecondsAfterFinished has passed. Spec is
  never written, and the one status write per pass is a merge patch.
- trainingruntimes: kopf lists and watches them into its index (a job's
  spec.runtimeRef is resolved from it); never written.
- trainingjobs/finalizers: creating children whose owner reference sets
  blockOwnerDeletion needs it where OwnerReferencesPermissionEnforcement is on.
- pods: watched (by label) and created and deleted as a gang. Services and
  PVCs are only created: the garbage collector removes them with their job.
- events: the operator posts core/v1 Events itself (kopf's posting is off).
- podgroups: created for gang scheduling with scheduler-plugins, Volcano or
  kube-scheduler's own (scheduling.k8s.io), and watched (by label) so the
  job's status mirrors the gang's placement. With scheduling.k8s.io the job's
  gang Workload is also created, and listed by name when a create answers 409
  (is it this job's?); it is never watched. Its PodGroups (one per gang
  generation) are deleted once their generation is over.
- workloads (Kueue): a queued job's Workload is created and watched; its
  status is server-side applied to clear an evicted job's reservation and to
  mark a finished job's Workload Finished; its spec.active is patched to follow
  the job's spec.suspend; it is deleted (and made anew) when the job's pod
  sets change while it waits.
*/}}
{{- define "torchfleet.rbac.namespacedRules" -}}
- apiGroups: ["torchfleet.dev"]
  resources: ["trainingjobs"]
  verbs: ["list", "watch", "delete"]
- apiGroups: ["torchfleet.dev"]
  resources: ["trainingruntimes"]
  verbs: ["list", "watch"]
- apiGroups: ["torchfleet.dev"]
  resources: ["trainingjobs/status"]
  verbs: ["patch"]
- apiGroups: ["torchfleet.dev"]
  resources: ["trainingjobs/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["services", "persistentvolumeclaims"]
  verbs: ["list", "watch", "create"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- range .Values.rbac.podGroupAPIGroups }}
- apiGroups: [{{ . | quote }}]
  resources: ["podgroups"]
  verbs: ["list", "watch", "create"]
{{- end }}
{{- if has "scheduling.k8s.io" .Values.rbac.podGroupAPIGroups }}
- apiGroups: ["scheduling.k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "create"]
- apiGroups: ["scheduling.k8s.io"]
  resources: ["podgroups"]
  verbs: ["delete"]
{{- end }}
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}

{{/*
Cluster-scoped reads:
- nodes: the operator watches them to notice a NotReady node losing its pods.
- customresourcedefinitions: kopf watches them to follow the TrainingJob
  resource appearing or going away (discovery itself needs no grant), and
  Kueue's Workload CRD (a queued job waits with a condition while it is absent).
- resourceflavors (Kueue): an admitted flavor's nodeLabels and tolerations go
  onto the pods.
- clustertrainingruntimes: a job's spec.runtimeRef may name one (read only;
  its users need no rights on it).
- priorityclasses: a queued job's Workload carries its PriorityClass's value.
- workloadpriorityclasses (Kueue): or that of the WorkloadPriorityClass its
  kueue.x-k8s.io/priority-class label names.
- namespaces, namespaced mode only: kopf lists and watches them to resolve its
  --namespace list. Refused, it retries for about half a minute, logging
  errors, before it starts watching at all. Cluster-wide it never lists them.
*/}}
{{- define "torchfleet.rbac.clusterRules" -}}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
- apiGroups: ["torchfleet.dev"]
  resources: ["clustertrainingruntimes"]
  verbs: ["list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["resourceflavors", "workloadpriorityclasses"]
  verbs: ["list", "watch"]
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  verbs: ["list", "watch"]
{{- if .Values.operator.watchNamespaces }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}

{{/*
Operator settings: flags of `torchfleet-operator` (main.py), and the
TORCHFLEET_OPERATOR_* variables its OperatorConfig reads by that prefix.
*/}}
{{- define "torchfleet.operator.args" -}}
- --log-level={{ .Values.operator.logLevel }}
- --health-port={{ .Values.operator.healthPort }}
- --metrics-port={{ .Values.operator.metricsPort }}
- --trainer-image={{ include "torchfleet.defaultTrainerImage" . }}
{{- if .Values.operator.leaderElection }}
- --leader-elect
- --leader-elect-name={{ include "torchfleet.leaseName" . }}
{{- end }}
{{- /* No --namespace flag means every namespace. */}}
{{- range (include "torchfleet.watchNamespaces" . | fromJsonArray) }}
- --namespace={{ . }}
{{- end }}
{{- end }}

{{- define "torchfleet.operator.env" -}}
{{- $defaults := .Values.operator.defaults -}}
- name: TORCHFLEET_OPERATOR_DEFAULT_SHM_SIZE
  value: {{ $defaults.shmSize | quote }}
- name: TORCHFLEET_OPERATOR_RESTART_BACKOFF_SECONDS
  value: {{ $defaults.restartBackoffSeconds | quote }}
- name: TORCHFLEET_OPERATOR_RESTART_BACKOFF_MAX_SECONDS
  value: {{ $defaults.restartBackoffMaxSeconds | quote }}
{{- if hasKey $defaults "nodeLossGraceSeconds" }}
- name: TORCHFLEET_OPERATOR_NODE_LOSS_FORCE_DELETE_SECONDS
  value: {{ $defaults.nodeLossGraceSeconds | quote }}
{{- end }}
{{- if .Values.operator.leaderElection }}
{{- /* The leader Lease lives in the operator's own namespace. */}}
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}
{{- end }}

{{/*
The leader election Lease: one per release, in the release namespace.
*/}}
{{- define "torchfleet.leaseName" -}}
{{ include "torchfleet.fullname" . }}-operator
{{- end }}
