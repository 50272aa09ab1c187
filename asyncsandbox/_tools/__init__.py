"""The agent tools (:mod:`asyncsandbox.tools`): results, arguments, the file editor, the toolbox."""
