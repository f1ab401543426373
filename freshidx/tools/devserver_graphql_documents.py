"""The GraphQL documents :class:`freshidx.tools.devserver_graphql.WebserverClient` writes itself,
because ``dagster_graphql``'s client has no call for them: workspace load errors, daemon health, an
asset run with an empty asset-check selection, backfills, sensors and a run's errors. The launch-backfill and
terminate-runs documents are Dagster's own (``dagster_graphql.client``)."""

WORKSPACE_QUERY = """
query FreshidxWorkspace {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on RepositoryLocation { name repositories { name } }
          ... on PythonError {
            message
            stack
            className
            errorChain { isExplicitLink error { message stack className } }
          }
        }
      }
    }
    ... on PythonError { message stack }
  }
}
"""

DAEMON_HEALTH_QUERY = """
query FreshidxDaemonHealth {
  instance {
    daemonHealth {
      allDaemonStatuses { daemonType required healthy lastHeartbeatErrors { message } }
    }
  }
}
"""

LAUNCH_RUN_MUTATION = """
mutation FreshidxLaunchRun($executionParams: ExecutionParams!) {
  launchRun(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId status } }
    ... on RunConfigValidationInvalid { errors { message path reason } }
    ... on Error { message }
    ... on PythonError { stack }
  }
}
"""

BACKFILL_QUERY = """
query FreshidxBackfill($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill {
      id
      status
      numPartitions
      partitionNames
      error { message stack }
      runs(limit: 1000) { runId status tags { key value } }
    }
    ... on Error { message }
  }
}
"""

CANCEL_BACKFILL_MUTATION = """
mutation FreshidxCancelBackfill($backfillId: String!) {
  cancelPartitionBackfill(backfillId: $backfillId) {
    __typename
    ... on CancelBackfillSuccess { backfillId }
    ... on Error { message }
    ... on PythonError { stack }
  }
}
"""

_SENSOR_FIELDS = """
  __typename
  ... on Sensor {
    name
    minIntervalSeconds
    sensorState {
      id
      selectorId
      status
      ticks(limit: $tickLimit) {
        tickId status timestamp endTimestamp runIds runKeys skipReason error { message }
      }
    }
  }
  ... on Error { message }
  ... on PythonError { stack }
"""

SENSOR_QUERY = (
    "query FreshidxSensor($sensorSelector: SensorSelector!, $tickLimit: Int) {\n"
    "  sensorOrError(sensorSelector: $sensorSelector) {" + _SENSOR_FIELDS + "}\n}\n"
)

START_SENSOR_MUTATION = (
    "mutation FreshidxStartSensor($sensorSelector: SensorSelector!, $tickLimit: Int) {\n"
    "  startSensor(sensorSelector: $sensorSelector) {" + _SENSOR_FIELDS + "}\n}\n"
)

STOP_SENSOR_MUTATION = """
mutation FreshidxStopSensor($id: String!) {
  stopSensor(id: $id) {
    __typename
    ... on StopSensorMutationResult { instigationState { id status } }
    ... on Error { message }
    ... on PythonError { stack }
  }
}
"""

#: A run's error events (step failures, run failure, engine errors): why a run failed, as the
#: run page's log shows it. ``limit`` bounds the page; a failed run's errors come near its end.
RUN_ERRORS_QUERY = """
query FreshidxRunErrors($runId: ID!, $afterCursor: String) {
  logsForRun(runId: $runId, afterCursor: $afterCursor, limit: 1000) {
    __typename
    ... on EventConnection {
      cursor
      hasMore
      events {
        __typename
        ... on MessageEvent { message stepKey }
        ... on ErrorEvent { error { className message cause { className message } } }
      }
    }
    ... on PythonError { message }
    ... on RunNotFoundError { message }
  }
}
"""
